"""The HTTP router: path parameters, methods, and the cache of resolved paths."""

from __future__ import annotations

from coreserve.server.httpd._http_messages import HttpRequest
from coreserve.server.rest._frontend import Router


async def _first(request: HttpRequest) -> None:
    return None


async def _second(request: HttpRequest) -> None:
    return None


def _router() -> Router:
    router = Router()
    router.add("GET", "/v2/models/stats", _second)
    router.add("POST", "/v2/models/{model}/infer", _first)
    router.add("POST", "/v2/models/{model}/versions/{version}/infer", _second)
    return router


def _request(method: str, path: str) -> HttpRequest:
    return HttpRequest(method, path, {}, b"")


def test_path_parameters_are_decoded() -> None:
    request = _request("POST", "/v2/models/my%20model/versions/3/infer")
    assert _router().resolve(request) is _second
    assert request.match_info == {"model": "my model", "version": "3"}


def test_method_and_unknown_paths_do_not_match() -> None:
    router = _router()
    assert router.resolve(_request("GET", "/v2/models/m/infer")) is None
    assert router.resolve(_request("POST", "/v2/models/m/unknown")) is None
    assert router.resolve(_request("GET", "/v2/models/stats")) is _second


def test_a_repeated_path_gets_the_same_answer_and_its_own_match_info() -> None:
    router = _router()
    first, second = _request("POST", "/v2/models/a/infer"), _request("POST", "/v2/models/a/infer")
    assert router.resolve(first) is _first and router.resolve(second) is _first
    first.match_info["model"] = "changed by a handler"
    assert second.match_info == {"model": "a"}
    third = _request("POST", "/v2/models/a/infer")
    router.resolve(third)
    assert third.match_info == {"model": "a"}


def test_the_cache_stays_bounded_and_keeps_answering() -> None:
    router = _router()
    for index in range(Router.CACHE_SIZE + 10):
        request = _request("POST", f"/v2/models/model{index}/infer")
        assert router.resolve(request) is _first
        assert request.match_info == {"model": f"model{index}"}
    assert len(router._resolved) <= Router.CACHE_SIZE
