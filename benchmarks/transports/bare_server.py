"""The reference point of the overhead benchmark: the least a Python v2 HTTP server can do.

One process, aiohttp on uvloop, v2 JSON parsed with orjson, onnxruntime run inline on the
event loop, JSON answered with orjson. No validation, no scheduling, no statistics. Usage:

    python benchmarks/transports/bare_server.py MODEL.onnx PORT
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import orjson
import uvloop
from aiohttp import web


def main(model_path: str, port: int) -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    output_names = [output.name for output in session.get_outputs()]

    async def infer(request: web.Request) -> web.Response:
        document = orjson.loads(await request.read())
        feeds = {
            item["name"]: np.asarray(item["data"], dtype=np.float32).reshape(item["shape"])
            for item in document["inputs"]
        }
        results = session.run(output_names, feeds)
        outputs = [
            {"name": name, "datatype": "FP32", "shape": list(array.shape), "data": array.ravel()}
            for name, array in zip(output_names, results, strict=True)
        ]
        body = orjson.dumps({"model_name": "add", "outputs": outputs}, option=orjson.OPT_SERIALIZE_NUMPY)
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    uvloop.run(web._run_app(app, host="127.0.0.1", port=port, access_log=None, print=None))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
