"""`frink bench`'s rows written out: llama-bench's markdown table, JSON or CSV."""

from __future__ import annotations

import csv
import io
import json

from .rows import BenchRow


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.2f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _ledger_cell(r: BenchRow) -> str:
    """Device submissions per decode token (tg rows) or per prompt (pp rows), then any
    refusals and failures per run, as `frink bench --submissions` reports them."""
    if r.submissions_by_kind is None:
        return ""
    n = r.submissions_per_token if r.submissions_per_token is not None else r.submissions
    cell = (
        f"{n:g}/{'token' if r.submissions_per_token is not None else 'prompt'}"
        if n is not None
        else ""
    )
    extra = [f"refused {k} x{v:g}" for k, v in (r.refusals or {}).items()]
    extra += [f"FAILED x{v:g}" for v in (r.failures or {}).values()]
    return "; ".join([cell, *extra]) if extra else cell


def format_md(rows: list[BenchRow], submissions: bool = False) -> str:
    """llama-bench's markdown table (plus the ratio to llama.cpp when compared, and the
    ledger's submissions with --submissions)."""
    compare = any(r.runner == "llama.cpp" for r in rows)
    head = ["model", "size", "params", "backend", "test", "t/s"]
    align = [":", "-:", "-:", ":", "-:", "-:"]
    if compare:
        head.append("vs llama.cpp")
        align.append("-:")
    if submissions:
        head.append("submissions")
        align.append("-:")
    lines = [
        "| " + " | ".join(head) + " |",
        "| "
        + " | ".join(("-" * 5 + a) if a.startswith("-") else (a + "-" * 5) for a in align)
        + " |",
    ]
    for r in rows:
        cells = [
            r.model,
            _size(r.model_size),
            _params(r.model_n_params),
            r.backend,
            r.test,
            f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}",
        ]
        if compare:
            cells.append(f"{r.ratio_vs_llama_cpp:.2f}x" if r.ratio_vs_llama_cpp is not None else "")
        if submissions:
            cells.append(_ledger_cell(r))
        lines.append("| " + " | ".join(cells) + " |")
    for r in rows:
        if r.ratio_vs_free is not None and r.mask_ms_per_token is not None:
            lines.append("")
            lines.append(
                f"{r.test}: {r.ratio_vs_free:.2f}x the free row's speed; the mask "
                f"{r.mask_ms_per_token:.2f} ms of a {1e3 / r.avg_ts:.1f} ms token"
            )
        if r.ratio_vs_greedy is not None and r.acceptance is not None:
            lines.append("")
            lines.append(
                f"{r.test}: {r.ratio_vs_greedy:.2f}x plain greedy decoding's speed; "
                f"{100 * r.acceptance:.0f}% of drafted tokens accepted"
            )
        if r.expert_hit_rate is not None and r.expert_bytes_per_token is not None:
            lines.append("")
            lines.append(
                f"{r.test}: expert cache hit rate {100 * r.expert_hit_rate:.1f}%, "
                f"{r.expert_bytes_per_token / 2**20:.2f} MiB read from the file per token"
            )
    peaks = [
        r.peak_memory_mib for r in rows if r.peak_memory_mib is not None and r.runner == "frink"
    ]
    cpp = [r.peak_memory_mib for r in rows if r.peak_memory_mib is not None and r.runner != "frink"]
    if peaks:
        lines.append("")
        line = f"peak memory (frink): {max(peaks):.0f} MiB"
        if cpp:
            line += f"; llama.cpp: {max(cpp):.0f} MiB ({max(peaks) / max(cpp):.2f}x)"
        lines.append(line)
    return "\n".join(lines) + "\n"


def format_json(rows: list[BenchRow], submissions: bool) -> str:
    """The rows as a JSON list, one object a row (BenchRow.to_dict)."""
    compare = any(r.runner == "llama.cpp" for r in rows)
    return json.dumps([r.to_dict(submissions, compare) for r in rows], indent=2) + "\n"


def format_csv(rows: list[BenchRow], submissions: bool) -> str:
    """The rows as CSV, a header of every key any row has; lists and dicts as JSON cells."""
    compare = any(r.runner == "llama.cpp" for r in rows)
    dicts = [r.to_dict(submissions, compare) for r in rows]
    fields: list[str] = []
    for d in dicts:
        fields.extend(k for k in d if k not in fields)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for d in dicts:
        # Lists and dicts as JSON inside one cell, as llama-bench writes its samples.
        w.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in d.items()})
    return buf.getvalue()
