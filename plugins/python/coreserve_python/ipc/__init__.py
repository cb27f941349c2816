"""The stub IPC: what crosses between the server and a stub, shared by both sides.

The protocol (`_messages`: one TypedDict per message), the framed channel the messages travel
on (`_channel`), the shared memory segments the tensors travel in (`_segments`), and the mark a
stub keeps in shared memory of the last execution it started (`_start_mark`). The server side
(`coreserve_python.server`) and the stub (`coreserve_python.stub`) import these names from here.

What this package may import: the standard library and numpy (ml_dtypes where present), nothing
of coreserve nor of the plugin's other packages: a stub may run in another Python environment.
"""

from __future__ import annotations

from coreserve_python.ipc._channel import FRAME_LENGTH, RECEIVE_CHUNK, RECENT_WAITS, Channel, encode_frame
from coreserve_python.ipc._messages import (
    SEQUENCE_END,
    SEQUENCE_START,
    AutoCompleteDoneMessage,
    AutoCompleteMessage,
    Blob,
    BlsCancelMessage,
    BlsRequestMessage,
    BlsResponseBody,
    BlsResponseMessage,
    CancelMessage,
    ErrorTuple,
    ExecuteDoneMessage,
    ExecuteMessage,
    FinalizeDoneMessage,
    FinalizeMessage,
    InitDoneMessage,
    InitMessage,
    LogMessage,
    Message,
    ReleaseMessage,
    ReplyMessage,
    RequestItem,
    ResponseBody,
    ResponsesMessage,
    TensorRef,
)
from coreserve_python.ipc._segments import (
    DTYPES,
    INLINE_LIMIT,
    SHM_DIR,
    STUB_OWNER,
    SegmentPool,
    SegmentReader,
    datatype_of,
    segment_prefix,
    segment_to_release,
    write_groups,
)
from coreserve_python.ipc._start_mark import NONE_STARTED, StartMark, open_start_mark

__all__ = [
    "DTYPES",
    "FRAME_LENGTH",
    "INLINE_LIMIT",
    "NONE_STARTED",
    "RECEIVE_CHUNK",
    "RECENT_WAITS",
    "SEQUENCE_END",
    "SEQUENCE_START",
    "SHM_DIR",
    "STUB_OWNER",
    "AutoCompleteDoneMessage",
    "AutoCompleteMessage",
    "Blob",
    "BlsCancelMessage",
    "BlsRequestMessage",
    "BlsResponseBody",
    "BlsResponseMessage",
    "CancelMessage",
    "Channel",
    "ErrorTuple",
    "ExecuteDoneMessage",
    "ExecuteMessage",
    "FinalizeDoneMessage",
    "FinalizeMessage",
    "InitDoneMessage",
    "InitMessage",
    "LogMessage",
    "Message",
    "ReleaseMessage",
    "ReplyMessage",
    "RequestItem",
    "ResponseBody",
    "ResponsesMessage",
    "SegmentPool",
    "SegmentReader",
    "StartMark",
    "TensorRef",
    "datatype_of",
    "encode_frame",
    "open_start_mark",
    "segment_prefix",
    "segment_to_release",
    "write_groups",
]
