"""`frink chat` in a pseudo-terminal, as a person uses it: two turns (the second reusing
the first's cache), Ctrl-C during an answer (the answer stops, the program does not),
/system and /reset, and end of input ending it cleanly."""

from __future__ import annotations

import re

import pytest
from frink_subprocess import child_env, frink_command

pexpect = pytest.importorskip("pexpect")

STATS = re.compile(r"\[(\d+) tokens, [\d.]+ tok/s, prompt (\d+) \((\d+) cached\)")


def test_chat_turns_interrupt_reset_and_eof(smollm2_path) -> None:
    cmd = frink_command()
    child = pexpect.spawn(
        cmd[0],
        [*cmd[1:], "chat", str(smollm2_path), "--temp", "0", "-n", "300", "--backend", "numpy"],
        env=child_env(),
        encoding="utf-8",
        timeout=120,
        dimensions=(40, 200),
    )
    try:
        child.expect_exact("> ")
        # (Asked plainly, SmolLM2 Q4_1 answers "L'Étoile, la Marseillaise, ..." in llama.cpp
        # and in frink's 8-bit decode alike; asked for one word, it names Paris in both.)
        child.sendline("What is the capital of France? Answer in one word.")
        child.expect(STATS)
        first_prompt = int(child.match.group(2))
        assert int(child.match.group(3)) == 0  # nothing cached before the first turn
        assert "Paris" in child.before
        child.expect_exact("> ")

        child.sendline("And of Italy?")
        child.expect(STATS)
        assert int(child.match.group(3)) >= first_prompt  # the first turn was reused
        child.expect_exact("> ")

        child.sendline("Write a very long story about a dragon and a knight.")
        child.expect_exact("knight.\r\n")  # the echo of the line
        child.expect(r"\w+ \w+ \w+")  # the answer has started
        child.sendintr()
        child.expect_exact("[answer stopped]")
        child.expect_exact("> ")

        child.sendline("/system You answer in one word.")
        child.expect_exact("conversation cleared")
        child.expect_exact("> ")
        child.sendline("Name a fruit.")
        child.expect(STATS)
        # The short system message replaced the template's long default one.
        assert int(child.match.group(2)) < first_prompt
        child.expect_exact("> ")

        child.sendline("/reset")
        child.expect_exact("conversation cleared")
        child.expect_exact("> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    assert "Traceback" not in (child.before or "")
