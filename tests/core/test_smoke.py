from belayq import ReliableQueue


def test_publish_claim_ack_roundtrip(any_client, make_queue):
    q: ReliableQueue = make_queue(any_client)
    msg_id = q.publish(b"hello")
    [d] = q.claim(timeout=0)
    assert (d.id, d.payload, d.deliveries) == (msg_id, b"hello", 1)
    assert q.ack(d) is True
    assert q.stats()["ready"] == 0 and q.stats()["in_flight"] == 0
