"""`Model`: one model of an in-process server, to ask about and to run inferences on."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from coreserve.config import config_to_dict
from coreserve.inprocess._loop import LoopThread
from coreserve.inprocess._tensors import input_arrays
from coreserve.types import InferenceRequest, InferenceResponse, ParameterValue

if TYPE_CHECKING:
    from coreserve.server.dataplane import DataPlane


class Model:
    """A model (and version) of a running `coreserve.Server`: get one with `server.model(name)`.

    A handle only: it holds no model. Each call finds the version that serves at that moment,
    so a handle outlives reloads; after an unload its calls raise `NotFoundError` or
    `UnavailableError`, as requests over the wire would fail.

    Inputs are a mapping of input name to tensor: numpy arrays, objects that speak DLPack
    (read without a copy), or lists; text becomes BYTES. Outputs are numpy arrays.
    """

    def __init__(self, dataplane: DataPlane, loop: LoopThread, name: str, version: int | str = "") -> None:
        self._dataplane = dataplane
        self._loop = loop
        self.name = name
        self.version = str(version)  # "": the latest ready version

    def __repr__(self) -> str:
        return f"Model({self.name!r}, version={self.version!r})"

    # About the model.

    def ready(self) -> bool:
        """True while the model (version) can serve requests."""
        return bool(self._loop.run(self._on_loop(self._dataplane.model_ready, self.name, self.version)))

    def metadata(self) -> dict[str, Any]:
        """Name, versions, platform, inputs and outputs: the v2 protocol's model metadata."""
        return self._loop.run(self._on_loop(self._dataplane.model_metadata, self.name, self.version))

    def config(self) -> dict[str, Any]:
        """The model configuration in force, as Triton's JSON model configuration."""
        config = self._loop.run(self._on_loop(self._dataplane.model_config, self.name, self.version))
        return config_to_dict(config)

    def statistics(self) -> dict[str, Any]:
        """Inference statistics, as the v2 statistics extension answers them (`model_stats`)."""
        return self._loop.run(self._on_loop(self._dataplane.statistics, self.name, self.version))

    # Inference.

    def infer(
        self,
        inputs: Mapping[str, Any],
        *,
        outputs: Iterable[str] | None = None,
        request_id: str = "",
        parameters: Mapping[str, ParameterValue] | None = None,
    ) -> InferenceResponse:
        """Runs one inference and blocks until its response arrives.

        :param inputs: input name -> tensor (numpy array, DLPack tensor, or list).
        :param outputs: the outputs to return (all of them when None).
        :param request_id: the request's id, echoed in the response.
        :param parameters: request parameters as the v2 protocol carries them (`priority`,
            `timeout`, `sequence_id`, `sequence_start`, `sequence_end`, or a model's own).
        :return: the response; its `outputs` map each output name to a numpy array.
        :raises CoreserveError: a subclass saying what failed (`InvalidArgumentError` for a
            request that does not fit the model, `UnsupportedError` for a decoupled model: use
            `stream`).
        """
        request = self._request(inputs, outputs, request_id, parameters)
        return self._loop.run(self._infer(request))

    async def async_infer(
        self,
        inputs: Mapping[str, Any],
        *,
        outputs: Iterable[str] | None = None,
        request_id: str = "",
        parameters: Mapping[str, ParameterValue] | None = None,
    ) -> InferenceResponse:
        """`infer` for async callers, on any event loop: cancelling the await cancels the request."""
        request = self._request(inputs, outputs, request_id, parameters)
        return await self._loop.call(self._infer(request))

    def stream(
        self,
        inputs: Mapping[str, Any],
        *,
        outputs: Iterable[str] | None = None,
        request_id: str = "",
        parameters: Mapping[str, ParameterValue] | None = None,
    ) -> Iterator[InferenceResponse]:
        """Yields each response of one request (many for a decoupled model, one otherwise).

        Arguments as for `infer`. Leaving the loop early cancels the request. An error of the
        model, one that would not end the request too (a decoupled model's), is raised.
        """
        request = self._request(inputs, outputs, request_id, parameters)
        return self._loop.iterate(_raising_errors(self._dataplane.stream(request)))

    async def async_stream(
        self,
        inputs: Mapping[str, Any],
        *,
        outputs: Iterable[str] | None = None,
        request_id: str = "",
        parameters: Mapping[str, ParameterValue] | None = None,
    ) -> AsyncIterator[InferenceResponse]:
        """`stream` for async callers: `async for response in model.async_stream(inputs)`."""
        request = self._request(inputs, outputs, request_id, parameters)
        async for response in self._loop.across(_raising_errors(self._dataplane.stream(request))):
            yield response

    # On the server's loop.

    def _request(
        self,
        inputs: Mapping[str, Any],
        outputs: Iterable[str] | None,
        request_id: str,
        parameters: Mapping[str, ParameterValue] | None,
    ) -> InferenceRequest:
        return InferenceRequest(
            model_name=self.name,
            inputs=input_arrays(inputs),
            model_version=self.version,
            id=request_id,
            parameters=dict(parameters or {}),
            requested_outputs=None if outputs is None else tuple(outputs),
        )

    async def _infer(self, request: InferenceRequest) -> InferenceResponse:
        return await self._dataplane.infer(
            request, endpoint="Model.infer", instead="Model.stream or Model.async_stream"
        )

    @staticmethod
    async def _on_loop(call: Callable[..., Any], *args: Any) -> Any:
        """Runs a data-plane call on the server's loop, where the repository may be read safely."""
        return call(*args)


async def _raising_errors(
    responses: AsyncGenerator[InferenceResponse, None],
) -> AsyncIterator[InferenceResponse]:
    """The responses, but one that carries an error raises it (and cancels the request)."""
    async with contextlib.aclosing(responses):
        async for response in responses:
            if response.error is not None:
                raise response.error
            yield response
