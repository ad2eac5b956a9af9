"""`GET /metrics` on `frink serve`: Prometheus text that prometheus_client's own parser
reads, whose counters match the requests made.

What must hold: after chat and text completions (whole and streamed) and Ollama chats and
generates, the prompt and generated token counters equal the sums of the usage those
answers reported; the finished-request counter and the two latency histograms count one
per request; the running and waiting gauges are 0 once all are answered; KV cache cells
used are the positions the slots hold, within the cache's capacity; the route wants the
API key.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest
from serve_process import Server, clean_stop, fuzz_base_model

parser = pytest.importorskip("prometheus_client.parser")

KEY = "metrics-key"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    path = fuzz_base_model(tmp_path_factory.mktemp("metrics"))
    with clean_stop(
        Server(path, "--api-key", KEY, "-np", "2", "-c", "64", "--backend", "numpy")
    ) as s:
        yield s


def _post(server: Server, path: str, body: dict) -> list[dict]:
    """The answer's JSON objects: one, or each line of an NDJSON or SSE stream."""
    req = urllib.request.Request(
        server.url + path, data=json.dumps(body).encode(), headers=AUTH, method="POST"
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read().decode()
    lines = [line.removeprefix("data: ") for line in text.splitlines() if line.strip()]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def _scrape(server: Server) -> dict[str, dict]:
    """Sample name -> {labels as a sorted tuple: value}."""
    req = urllib.request.Request(server.url + "/metrics", headers=AUTH)
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: dict[str, dict] = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _one(samples: dict[str, dict], name: str) -> float:
    return samples[name][()]


def test_counters_match_the_usage_reported(server):
    before = _scrape(server)
    assert _one(before, "frink_prompt_tokens_total") == 0
    msgs = [{"role": "user", "content": "hi"}]
    greedy = {"temperature": 0}
    prompt = completion = 0
    for body in (
        {"messages": msgs, "max_tokens": 5, **greedy},
        {"messages": msgs, "max_tokens": 3, "stream": True, **greedy},
    ):
        body["stream_options"] = {"include_usage": True} if body.get("stream") else None
        usage = _post(server, "/v1/chat/completions", body)[-1]["usage"]
        prompt += usage["prompt_tokens"]
        completion += usage["completion_tokens"]
    usage = _post(server, "/v1/completions", {"prompt": "ab", "max_tokens": 4, **greedy})[-1][
        "usage"
    ]
    prompt += usage["prompt_tokens"]
    completion += usage["completion_tokens"]
    for path, body in (
        ("/api/chat", {"model": "tiny", "messages": msgs, "options": {"num_predict": 6}}),
        ("/api/generate", {"model": "tiny", "prompt": "x", "stream": False}),
    ):
        last = _post(server, path, {**body, "options": {"num_predict": 6, **greedy}})[-1]
        assert last["done"]
        prompt += last["prompt_eval_count"]
        completion += last["eval_count"]
    after = _scrape(server)
    assert _one(after, "frink_prompt_tokens_total") == prompt
    assert _one(after, "frink_generated_tokens_total") == completion
    finished = after["frink_requests_finished_total"]
    assert sum(finished.values()) == 5 and set(finished) <= {
        (("reason", "stop"),),
        (("reason", "length"),),
    }
    assert _one(after, "frink_time_to_first_token_seconds_count") == 5
    assert _one(after, "frink_time_to_first_token_seconds_sum") > 0
    assert _one(after, "frink_time_per_output_token_seconds_count") == 5  # each made > 1
    assert _one(after, "frink_requests_running") == 0
    assert _one(after, "frink_requests_waiting") == 0
    cells = _one(after, "frink_kv_cache_cells_used")
    assert 0 < cells <= _one(after, "frink_kv_cache_cells") == 2 * 64


def test_metrics_want_the_key(server):
    status, body = server.get("/metrics")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
