"""`frink parity`: does an accelerated backend compute the same model as the host body?

The same tokens go through the host body and through the backend: a prefill, then a
greedy decode of `steps` tokens (the host's choice feeds both, so they stay aligned; a
correct first token proves nothing about the decode path). Reported: per-layer max |d|
of the prefill hidden state (each side chaining its own hidden, so drift shows where it
starts), per-step KL(host || backend) of the next-token distribution, top-1 agreement,
and the backend's ledger (submissions per decode token, refusals by reason).

Verdicts: MATCH when every step's KL is under the bar (1e-5 for unquantized weights,
1e-3 for quantized) and top-1 agrees; DRIFT when top-1 agrees but KL exceeds it; WRONG
when top-1 differs where the host's own logits are not a near-tie. Agreement proves
something only if the device computed: FAILED when any launch failed (the host body ran
those layers, so it was compared with itself there), NOT RUN when no layer ran on the
device or it made no submission. Only MATCH and DRIFT are a passing check (`ok`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .backends import LaunchFailed, Refusal, Run
from .decoder import Decoder
from .quant.kernels import exact_activations

UNQUANTIZED = {"F32", "F16", "BF16"}
KL_BAR = {False: 1e-5, True: 1e-3}
NEAR_TIE = 1e-2  # host logit gap under which a top-1 flip is not a wrong answer
PASSING = ("MATCH", "DRIFT")


@dataclass
class ParityReport:
    backend: str
    quantized: bool
    kl_bar: float
    n_prompt: int
    steps: int
    layer_max_abs: list[float] = field(default_factory=list)
    layer_on_backend: list[bool] = field(default_factory=list)
    prefill_logits_max_abs: float = 0.0
    step_kl: list[float] = field(default_factory=list)
    step_top1_agree: list[bool] = field(default_factory=list)
    step_near_tie: list[bool] = field(default_factory=list)
    submissions_per_decode_token: float = 0.0
    submissions_prefill: int = 0
    submissions_by_kind: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)  # launches failed, by message
    verdict: str = ""
    why: str = ""  # what the verdict rests on, one line

    @property
    def ok(self) -> bool:
        """The check passed: the device ran, nothing failed, and the answers agree."""
        return self.verdict in PASSING

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64) - x.max()
    e = np.exp(z)
    return e / e.sum()


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p, q = _softmax(p_logits), _softmax(q_logits)
    mask = p > 0
    return float(np.sum(p[mask] * (np.log(p[mask]) - np.log(np.maximum(q[mask], 1e-300)))))


def _layerwise(
    dec: Decoder, ids: np.ndarray, single_layer_runs: bool, failures: Counter[str]
) -> list[tuple[np.ndarray, bool]]:
    """Prefill `ids` on a fresh cache, returning (hidden after layer l, ran on backend);
    a launch that fails is counted in `failures` and its layer run on the host."""
    cache = dec.new_cache(len(ids) + 1)
    cache.check_room(len(ids))
    positions = np.arange(len(ids))
    x = dec.host.embed(ids)
    backend = dec.backend if single_layer_runs else None
    out = []
    for layer in range(dec.cfg.n_layer):
        plan = (
            backend.plan("prefill", layer, len(ids), cache, positions=positions)
            if backend
            else None
        )
        on_backend = plan is not None and not isinstance(plan, Refusal)
        if on_backend and backend is not None:
            try:
                x = backend.run(Run(layer, layer + 1), x, positions, cache)
            except LaunchFailed as e:
                failures[str(e)] += 1
                on_backend = False
        if not on_backend:
            x = dec.host.layer(layer, x, positions, cache)
        out.append((x.copy(), on_backend))
    return out


def check_parity(model, ids: list[int], steps: int) -> ParityReport:
    """`model` is a loaded frink Model whose decoder has a backend. The host body runs with
    exact f32 activations, the reference an accelerated backend is held to (its default
    8-bit rounding of activations, llama.cpp's, is checked against llama.cpp instead)."""
    with exact_activations():
        return _check_parity(model, ids, steps)


def _check_parity(model, ids: list[int], steps: int) -> ParityReport:
    dec = model.decoder
    backend = dec.backend
    if backend is None:
        raise ValueError("parity needs a model loaded with an accelerated backend")
    # The same weights and cache types, no backend.
    host = Decoder(dec.cfg, dec.host.w, cache_types=dec.cache_types)
    tensors = model.checkpoint.tensors
    quantized = any(tensors.info(n).dtype not in UNQUANTIZED for n in tensors.names())
    report = ParityReport(
        backend=backend.name,
        quantized=quantized,
        kl_bar=KL_BAR[quantized],
        n_prompt=len(ids),
        steps=steps,
    )
    ids_arr = np.asarray(ids, dtype=np.int64)

    failures: Counter[str] = Counter()
    host_layers = _layerwise(host, ids_arr, False, failures)
    for (xh, _), (xb, on_dev) in zip(host_layers, _layerwise(dec, ids_arr, True, failures)):
        report.layer_max_abs.append(float(np.abs(xh - xb).max()))
        report.layer_on_backend.append(on_dev)

    n_ctx = len(ids) + steps + 1
    hc, bc = host.new_cache(n_ctx), dec.new_cache(n_ctx)
    backend.ledger.reset()
    lh = host.step(ids_arr, hc, all_logits=True)
    lb = dec.step(ids_arr, bc, all_logits=True)
    report.submissions_prefill = backend.ledger.total()
    report.prefill_logits_max_abs = float(np.abs(lh - lb).max())
    last_h, last_b = lh[-1], lb[-1]
    decode_submissions = 0
    for step in range(steps + 1):
        report.step_kl.append(kl_divergence(last_h, last_b))
        top_h, top_b = int(last_h.argmax()), int(last_b.argmax())
        report.step_top1_agree.append(top_h == top_b)
        # A disagreement the host itself nearly made (its two candidates within NEAR_TIE);
        # False where the two agree, so the list marks only the forgivable flips.
        report.step_near_tie.append(
            top_h != top_b and bool(last_h[top_h] - last_h[top_b] < NEAR_TIE)
        )
        if step == steps:
            break
        token = np.array([top_h])
        last_h = host.step(token, hc)[-1]
        before = backend.ledger.total()
        last_b = dec.step(token, bc)[-1]
        decode_submissions += backend.ledger.total() - before
    report.submissions_per_decode_token = decode_submissions / steps if steps else 0.0
    report.submissions_by_kind = dict(backend.ledger.submissions)
    report.refusals = dict(backend.ledger.refusals)
    failures.update(backend.ledger.failures)
    report.failures = dict(failures)
    report.verdict, report.why = verdict(report)
    return report


def verdict(r: ParityReport) -> tuple[str, str]:
    """(verdict, why) of a filled report. A wrong answer is named first; then whether the
    device took part at all, since agreement means nothing where it did not."""
    if not all(a or tie for a, tie in zip(r.step_top1_agree, r.step_near_tie)):
        flips = sum(not (a or tie) for a, tie in zip(r.step_top1_agree, r.step_near_tie))
        return "WRONG", f"top-1 differs at {flips} of {len(r.step_top1_agree)} steps"
    if r.failures:
        return "FAILED", f"{sum(r.failures.values())} device launches failed: " + "; ".join(
            r.failures
        )
    n_device = sum(r.layer_on_backend)
    submissions = sum(r.submissions_by_kind.values())
    if n_device == 0 or submissions == 0:
        refused = ", ".join(r.refusals) or "no refusal recorded"
        return "NOT RUN", (
            f"the device ran {n_device} layers in {submissions} submissions (refused: {refused})"
        )
    bar = f"max KL {max(r.step_kl):.3g} vs bar {r.kl_bar:g}"
    if all(r.step_top1_agree) and max(r.step_kl) < r.kl_bar:
        return "MATCH", f"{bar}; the device ran {n_device} of {len(r.layer_on_backend)} layers"
    return "DRIFT", bar


def print_report(r: ParityReport, write: Callable[[str], Any]) -> None:
    """`frink parity`'s text of a report through `write`: the run, each layer's largest
    difference and where it ran, the prefill and decode comparisons, the device's
    submissions, any failures, and the verdict."""
    write(
        f"backend {r.backend}: {r.n_prompt} prompt tokens, {r.steps} decode steps, "
        f"{'quantized' if r.quantized else 'unquantized'} weights (KL bar {r.kl_bar:g})\n"
    )
    for i, (d, on) in enumerate(zip(r.layer_max_abs, r.layer_on_backend)):
        write(f"  layer {i:<3} {'device' if on else 'host  '}  max|d| {d:.3g}\n")
    write(f"prefill logits max|d| {r.prefill_logits_max_abs:.3g}\n")
    write(
        f"decode: max KL {max(r.step_kl):.3g}, top-1 agreement "
        f"{sum(r.step_top1_agree)}/{len(r.step_top1_agree)}\n"
    )
    write(
        f"submissions: prefill {r.submissions_prefill}, per decode token "
        f"{r.submissions_per_decode_token:.2f}; by kind {r.submissions_by_kind}; "
        f"refusals {r.refusals}\n"
    )
    for message, n in r.failures.items():
        write(f"FAILED x{n}: {message}\n")
    write(f"verdict: {r.verdict} ({r.why})\n")
