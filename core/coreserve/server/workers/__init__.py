"""Frontends on every core: worker processes that are each a whole server on the same ports,
and the supervisor that makes them one server to their users.

`coreserve --http-thread-count N` (or `--grpc-infer-thread-count N`) runs a `Supervisor`,
which starts N workers: the same command, told by `CORESERVE_WORKER` which one it is
(`WorkerRole`). Each worker joins through its `WorkerLink` before it opens its ports.

Layer 7, beside `server.app`: it imports the data plane and the metrics report; the runtime
(`server.app`) imports this package, never the other way round.
"""

from coreserve.server.workers._channel import message_limit
from coreserve.server.workers._link import WorkerLink
from coreserve.server.workers._role import WORKER_ENV, WorkerRole
from coreserve.server.workers._supervisor import Supervisor

__all__ = ["WORKER_ENV", "Supervisor", "WorkerLink", "WorkerRole", "message_limit"]
