"""The commands each script may call are read from its text (sources.commands): the ACL
check each script makes before its first write is built from them."""

from __future__ import annotations

import pytest

from belayq import sources


def test_a_read_only_script_lists_only_what_it_reads() -> None:
    assert sources.commands("stats") == (("HGETALL", "LLEN", "LPOS", "ZCARD"), (), False)
    assert sources.flags("stats") == ("no-writes",)


def test_history_commands_are_listed_apart_and_events_flagged() -> None:
    always, history, events = sources.commands("ack")
    assert set(history) == {"LPUSH", "LTRIM", "PEXPIRE"} and events
    assert {"ZREM", "HDEL", "HINCRBY"} <= set(always) and not set(history) & set(always)


def test_functions_the_script_never_reaches_do_not_count() -> None:
    always, _, events = sources.commands("drop", function=True)
    assert always == ("DEL", "LLEN", "ZCARD") and not events
    # as a script, its first command is the harmless write a full server lets through
    assert sources.commands("drop")[0] == ("DEL", "LLEN", "ZCARD", "ZREM")


@pytest.mark.parametrize("name", sources.SCRIPT_NAMES)
def test_every_script_checks_its_commands_in_its_preamble(name: str) -> None:
    always, _, _ = sources.commands(name)
    text = sources.source(name)
    check = next(line for line in text.splitlines() if line.startswith("check_acl("))
    assert all(f"'{c}'" in check for c in always)


def test_a_command_that_cannot_be_read_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot tell which command"):
        sources._calls("redis.call(name, KEYS[1])", "x.lua")
