"""Streamed tokens/s and time to first token: the OpenAI frontend against KServe's generate_stream.

    python -m benchmarks.transports.openai_stream [--seconds 10] [--max-tokens 64] [--rounds 2]

One server serves `charlm`, the tests' decoupled character n-gram model (one token, one response
per character; trained at start-up, see tests/support/servers/openai_repository.py), on both doors. At
concurrency 1 and 32, clients stream completions of `--max-tokens` tokens back to back for
`--seconds`, through `POST /v1/completions` with `"stream": true` and through
`POST /v2/models/charlm/generate_stream`; the two alternate for `--rounds` rounds and each
figure is the median round. Both clients are aiohttp reading server-sent events, so the
difference is the frontend's. Writes benchmarks/results/openai_stream.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from benchmarks.support.models import start_server
from benchmarks.support.reporting import Table, print_table, write_results
from support.servers.openai_repository import openai_repository, openai_url

PROMPT = "The server reads its models"


@dataclass
class Round:
    tokens_per_second: float
    ttft_ms_median: float
    ttft_ms_p90: float
    requests: int


def _openai_request(base: str, max_tokens: int, seed: int) -> tuple[str, dict[str, Any]]:
    body = {"model": "charlm", "prompt": PROMPT, "max_tokens": max_tokens, "seed": seed, "stream": True}
    return f"{base}/completions", body


def _generate_request(base: str, max_tokens: int, seed: int) -> tuple[str, dict[str, Any]]:
    body = {"text_input": PROMPT, "max_tokens": max_tokens, "seed": seed, "stream": True}
    return f"{base}/v2/models/charlm/generate_stream", body


def _text(event: dict[str, Any]) -> str:
    if "choices" in event:
        return str(event["choices"][0]["text"]) if event["choices"] else ""
    return str(event.get("text_output", ""))


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, int]:
    """Streams one completion: (seconds to its first token, tokens received)."""
    started = time.perf_counter()
    first = None
    tokens = 0
    async with session.post(url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: {response.status} {await response.text()}")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            text = _text(json.loads(line[6:]))
            if text:
                tokens += len(text)  # charlm: one token per character
                if first is None:
                    first = time.perf_counter() - started
    if first is None:
        raise RuntimeError(f"{url}: no token")
    return first, tokens


async def _round(make: Any, base: str, concurrency: int, seconds: float, max_tokens: int) -> Round:
    ttfts: list[float] = []
    tokens = 0
    limit = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=limit, timeout=aiohttp.ClientTimeout(total=300)) as session:
        deadline = time.perf_counter() + seconds

        async def client(index: int) -> None:
            nonlocal tokens
            seed = index * 1000
            while time.perf_counter() < deadline:
                seed += 1
                first, count = await _stream(session, *make(base, max_tokens, seed))
                ttfts.append(first)
                tokens += count

        started = time.perf_counter()
        await asyncio.gather(*(client(index) for index in range(concurrency)))
        elapsed = time.perf_counter() - started
    ttfts.sort()
    return Round(
        tokens_per_second=tokens / elapsed,
        ttft_ms_median=statistics.median(ttfts) * 1000,
        ttft_ms_p90=ttfts[int(0.9 * (len(ttfts) - 1))] * 1000,
        requests=len(ttfts),
    )


async def openai_stream_round(base: str, concurrency: int, seconds: float, max_tokens: int) -> Round:
    """`concurrency` clients streaming completions from the OpenAI frontend at `base` for `seconds`."""
    return await _round(_openai_request, base, concurrency, seconds, max_tokens)


def _median_round(rounds: list[Round]) -> Round:
    return sorted(rounds, key=lambda r: r.tokens_per_second)[len(rounds) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="per round and door (default 10)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per completion (default 64)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per door (default 2)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        server = start_server(openai_repository(Path(folder) / "models"), "--openai-port=0")
        try:
            base = openai_url(server)
            http = f"http://{server.http_url}"
            print(f"OpenAI frontend at {urlsplit(base).netloc}, KServe HTTP at {server.http_url}")
            doors = {"openai": (_openai_request, base), "generate_stream": (_generate_request, http)}
            for make, url in doors.values():  # warm up both paths and the model's instances
                asyncio.run(_round(make, url, 2, 1.0, args.max_tokens))
            results: dict[str, dict[str, Round]] = {}
            for concurrency in args.concurrency:
                measured: dict[str, list[Round]] = {name: [] for name in doors}
                for index in range(args.rounds):
                    order = list(doors) if index % 2 == 0 else list(reversed(doors))
                    for name in order:
                        make, url = doors[name]
                        measured[name].append(
                            asyncio.run(_round(make, url, concurrency, args.seconds, args.max_tokens))
                        )
                results[f"c{concurrency}"] = {
                    name: _median_round(rounds) for name, rounds in measured.items()
                }
        finally:
            server.close()
    rows = []
    for key, doors_results in results.items():
        for name, result in doors_results.items():
            rows.append(
                [
                    key,
                    name,
                    result.tokens_per_second,
                    result.ttft_ms_median,
                    result.ttft_ms_p90,
                    result.requests,
                ]
            )
        ratio = doors_results["openai"].tokens_per_second / doors_results["generate_stream"].tokens_per_second
        rows.append([key, "openai / generate_stream", ratio, "", "", ""])
    tables: list[Table] = []
    tables.append(
        print_table(
            f"Streamed completions of {args.max_tokens} tokens (median of {args.rounds} rounds of {args.seconds:g} s)",
            ["concurrency", "door", "tokens/s", "TTFT ms median", "TTFT ms p90", "requests"],
            rows,
        )
    )
    print(f"\nwrote {write_results('openai_stream', args, tables, {'results': results})}")


if __name__ == "__main__":
    main()
