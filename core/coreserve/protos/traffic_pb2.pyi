from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ModelTrafficRequest(_message.Message):
    __slots__ = ("model_name", "policy_json")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_JSON_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    policy_json: str
    def __init__(self, model_name: _Optional[str] = ..., policy_json: _Optional[str] = ...) -> None: ...

class ModelTrafficResponse(_message.Message):
    __slots__ = ("policy_json",)
    POLICY_JSON_FIELD_NUMBER: _ClassVar[int]
    policy_json: str
    def __init__(self, policy_json: _Optional[str] = ...) -> None: ...

class ModelRolloutRequest(_message.Message):
    __slots__ = ("model_name", "action", "plan_json")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    action: str
    plan_json: str
    def __init__(self, model_name: _Optional[str] = ..., action: _Optional[str] = ..., plan_json: _Optional[str] = ...) -> None: ...

class ModelRolloutResponse(_message.Message):
    __slots__ = ("status_json",)
    STATUS_JSON_FIELD_NUMBER: _ClassVar[int]
    status_json: str
    def __init__(self, status_json: _Optional[str] = ...) -> None: ...
