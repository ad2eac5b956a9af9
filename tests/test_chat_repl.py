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


def test_chat_escapes_control_sequences_and_says_when_the_context_is_full(tmp_path) -> None:
    """On scripts/fuzz_inputs.py's tiny model, every answer token forced (logit_bias) to
    the ESC byte: the terminal gets "\\x1b" written out, never the byte; and the answer,
    cut by the 32-token context before -n, ends with a note saying so."""
    import io

    from script_loader import load_script

    from frink_cli import load
    from frink_cli.repl import chat_loop
    from frink_cli.sampling import SamplingParams

    F = load_script("fuzz_inputs")
    path = tmp_path / "tiny.gguf"
    path.write_bytes(F.base().encode())
    model = load(path, backend="numpy")
    esc = model.tokenizer.token_id("<0x1B>")
    out, notes = io.StringIO(), []
    lines = iter(["hello"])

    def read(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    chat_loop(
        model,
        n_ctx=32,
        params=SamplingParams(temperature=0, logit_bias=((esc, 100.0),)),
        max_tokens=100,
        system=None,
        out=out,
        note=notes.append,
        read=read,
    )
    shown = out.getvalue()
    assert "\x1b" not in shown and "\\x1b" in shown, repr(shown)
    assert any("context of 32 tokens is full" in n for n in notes), notes
