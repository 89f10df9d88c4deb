import time

from belayq import ReliableQueue


def test_publish_claim_ack_roundtrip(any_client, make_queue):
    q: ReliableQueue = make_queue(any_client)
    msg_id = q.publish(b"hello")
    [d] = q.claim(timeout=0)
    assert (d.id, d.payload, d.deliveries) == (msg_id, b"hello", 1)
    assert q.ack(d) is True
    assert q.stats()["ready"] == 0 and q.stats()["in_flight"] == 0


def test_ack_and_claim_settles_and_claims_in_one_round_trip(any_client, make_queue):
    q: ReliableQueue = make_queue(any_client)
    ids = [q.publish(f"m{i}".encode()) for i in range(3)]
    [first] = q.claim(timeout=0)
    acked, got = q.ack_and_claim([first], 2)
    assert acked == [True]
    assert [d.id for d in [first, *got]] == ids
    assert [d.deliveries for d in got] == [1, 1]
    s = q.stats()
    assert (s["ready"], s["in_flight"], s["leased"]) == (0, 2, 2)
    acked, more = q.ack_and_claim(got, 5)
    assert (acked, more) == ([True, True], [])
    assert q.stats()["in_flight"] == 0


def test_ack_and_claim_refuses_a_stale_token_and_still_claims(any_client, make_queue):
    q: ReliableQueue = make_queue(any_client, lease_ms=100)
    q.publish(b"a")
    [old] = q.claim(timeout=0)
    q.forget([old])
    time.sleep(0.2)
    q.sweep()  # the lease ran out: "a" is ready again with a new token on its next claim
    acked, got = q.ack_and_claim([old], 1)
    assert acked == [False]
    assert [(d.id, d.deliveries) for d in got] == [(old.id, 2)]
    assert q.stats()["stale_acks"] == 1
    assert q.ack(got[0])


def test_ack_and_claim_reloads_scripts_the_server_lost(r, make_queue):
    q: ReliableQueue = make_queue(r)
    q.publish(b"a")
    q.publish(b"b")
    [d] = q.claim(timeout=0)
    r.script_flush()
    acked, got = q.ack_and_claim([d], 1)
    assert acked == [True] and [x.payload for x in got] == [b"b"]
