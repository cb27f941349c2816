"""A toy chat model for the OpenAI frontend: it answers "You said: <the user's last words>".

Nothing is learnt or downloaded; a word is a token. The prompt is what the chat template of
config.pbtxt renders (one "role: content" line per message, then "assistant:"); the answer
echoes the content of the last "user:" line, or the whole prompt when there is none (a plain
completion). Decoupled: one response per word, so a streaming client sees the words arrive.
`max_tokens` (default 16) caps the words; each response reports its token counts as the vLLM
backend does, which the frontend turns into `usage`.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

DEFAULT_MAX_TOKENS = 16
USER_PREFIX = "user:"


def _last_user_words(prompt):
    lines = [line.strip() for line in prompt.splitlines()]
    said = [line[len(USER_PREFIX) :] for line in lines if line.startswith(USER_PREFIX)]
    return (said[-1] if said else prompt).split()


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            prompt = prompt.decode("utf-8", errors="replace")
            limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            max_tokens = DEFAULT_MAX_TOKENS if limit is None else int(limit.as_numpy().reshape(-1)[0])
            words = ["You", "said:", *_last_user_words(prompt)][: max(max_tokens, 0)]
            sender = request.get_response_sender()
            for index, word in enumerate(words):
                if sender.is_cancelled():
                    break
                text = word if index == 0 else " " + word
                sender.send(self._response(text, len(prompt.split())))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    @staticmethod
    def _response(text, input_tokens):
        outputs = [
            pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=object)),
            pb_utils.Tensor("num_input_tokens", np.array([input_tokens], dtype=np.uint32)),
            pb_utils.Tensor("num_output_tokens", np.array([1], dtype=np.uint32)),
        ]
        return pb_utils.InferenceResponse(outputs)
