"""`coreserve traffic` and `coreserve rollout`: a running server's traffic between a model's
versions, read and changed through its HTTP repository API.

    coreserve traffic MODEL [--url URL] [--weights 1=90,2=10] [--shadow 3=100] [--clear]
    coreserve rollout start MODEL --candidate V --steps 10,50,100 --dwell-s 60 [guards] [--url URL]
    coreserve rollout status|promote|abort MODEL [--url URL]

Each prints the server's answer (the policy, or the rollout's status) as JSON; a refusal is
printed as the server words it, with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

DEFAULT_URL = "127.0.0.1:8000"
TIMEOUT_S = 30.0
URL_HELP = f"the server's HTTP address (default {DEFAULT_URL})"


def traffic_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="coreserve traffic",
        description="A model's traffic policy. --weights and --shadow replace the whole policy: give both "
        "to keep both.",
    )
    parser.add_argument("model")
    parser.add_argument("--url", default=DEFAULT_URL, help=URL_HELP)
    parser.add_argument("--weights", help="percents by version for requests that name none: 1=90,2=10")
    parser.add_argument("--shadow", help="a share of requests also sent to a version: VERSION=PERCENT")
    parser.add_argument("--clear", action="store_true", help="remove the policy (the latest version serves)")
    args = parser.parse_args(argv)
    path = f"/v2/repository/models/{_quoted(args.model)}/traffic"
    if args.clear and (args.weights or args.shadow):
        parser.error("--clear takes no --weights or --shadow")
    if not (args.clear or args.weights or args.shadow):
        return _call(args.url, "GET", path)
    policy: dict[str, Any] = {}
    if args.weights:
        policy["weights"] = dict(_pairs(parser, args.weights, "--weights"))
    if args.shadow:
        pairs = _pairs(parser, args.shadow, "--shadow")
        if len(pairs) != 1:
            parser.error(f"--shadow takes one VERSION=PERCENT, got '{args.shadow}'")
        [(version, share)] = pairs
        policy["shadow"] = {"version": version, "share": share}
    return _call(args.url, "POST", path, policy)


def rollout_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="coreserve rollout", description="A model's canary rollout.")
    parser.add_argument("action", choices=("start", "status", "promote", "abort"))
    parser.add_argument("model")
    parser.add_argument("--url", default=DEFAULT_URL, help=URL_HELP)
    parser.add_argument("--candidate", help="start: the version rolled out")
    parser.add_argument("--steps", help="start: the candidate's percent at each step, e.g. 10,50,100")
    parser.add_argument("--dwell-s", type=finite, help="start: how long each step lasts before it is judged")
    parser.add_argument("--max-error-rate-increase", type=finite, help="start: guard (default 0.01)")
    parser.add_argument("--max-p99-ratio", type=finite, help="start: guard (default 2)")
    parser.add_argument(
        "--min-requests", type=int, help="start: requests a step needs to be judged (default 20)"
    )
    args = parser.parse_args(argv)
    path = f"/v2/repository/models/{_quoted(args.model)}/rollout"
    if args.action == "status":
        return _call(args.url, "GET", path)
    if args.action in ("promote", "abort"):
        return _call(args.url, "POST", f"{path}/{args.action}")
    if args.candidate is None or args.steps is None or args.dwell_s is None:
        parser.error("start needs --candidate, --steps and --dwell-s")
    try:
        steps = [finite(step) for step in args.steps.split(",")]
    except ValueError:
        parser.error(f"--steps must be percents separated by commas, got '{args.steps}'")
    plan: dict[str, Any] = {"candidate": args.candidate, "steps": steps, "dwell_s": args.dwell_s}
    for option in ("max_error_rate_increase", "max_p99_ratio", "min_requests"):
        if getattr(args, option) is not None:
            plan[option] = getattr(args, option)
    return _call(args.url, "POST", path, plan)


def _pairs(parser: argparse.ArgumentParser, text: str, option: str) -> list[tuple[str, float]]:
    pairs: list[tuple[str, float]] = []
    for item in text.split(","):
        version, equals, value = item.partition("=")
        try:
            pairs.append((version.strip(), finite(value)))
        except ValueError:
            equals = ""
        if not equals:
            parser.error(f"{option} takes VERSION=PERCENT pairs separated by commas, got '{text}'")
        if pairs[-1][0] in (named for named, _ in pairs[:-1]):
            parser.error(f"{option} names version {pairs[-1][0]} twice: '{text}'")
    return pairs


def finite(text: str) -> float:
    """A number argparse takes (JSON has no NaN or infinity to send)."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {text}")
    return number


def _quoted(model: str) -> str:
    return urllib.parse.quote(model, safe="")


def _call(url: str, method: str, path: str, body: object = None) -> int:
    data = json.dumps(body).encode() if body is not None else None
    base = url if "://" in url else f"http://{url}"  # host:port, as tritonclient takes it
    request = urllib.request.Request(base.rstrip("/") + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            print(json.dumps(json.loads(response.read()), indent=2))
            return 0
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        print(f"coreserve: error: {message} (HTTP {exc.code})", file=sys.stderr)
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        print(f"coreserve: error: cannot reach the server at {url}: {reason}", file=sys.stderr)
    return 1
