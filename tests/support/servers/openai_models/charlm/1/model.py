"""A character-level n-gram language model, decoupled: one response per generated character.

Sampling options are optional inputs (max_tokens, temperature, top_p, seed, stop); each
response reports its token counts (one token per character) as the vLLM backend does.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

DEFAULT_MAX_TOKENS = 16


def _option(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    values = tensor.as_numpy().reshape(-1)
    if name == "stop":
        return values.tolist()
    return values[0] if isinstance(values[0], bytes) else values[0].item()


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(folder, "ngrams.json"), encoding="utf-8") as file:
            trained = json.load(file)
        self.order = trained["order"]
        self.alphabet = trained["alphabet"]
        self.counts = {context: np.array(row, dtype=np.float64) for context, row in trained["counts"].items()}
        self.fallback = np.array(trained["unigram"], dtype=np.float64)
        parameters = json.loads(args["model_config"])["parameters"]
        self.max_prompt_chars = int(parameters["max_prompt_chars"]["string_value"])

    def _next(self, text, rng, temperature, top_p):
        weights = self.counts.get(text[-(self.order - 1) :], self.fallback)
        if temperature == 0:
            return self.alphabet[int(np.argmax(weights))]
        logits = np.log(weights + 1e-9) / temperature
        probabilities = np.exp(logits - logits.max())
        probabilities /= probabilities.sum()
        order = np.argsort(-probabilities)
        kept = order[: int(np.searchsorted(np.cumsum(probabilities[order]), top_p) + 1)]
        kept_p = probabilities[kept] / probabilities[kept].sum()
        return self.alphabet[int(rng.choice(kept, p=kept_p))]

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            prompt = _option(request, "text_input", b"").decode("utf-8")
            if len(prompt) > self.max_prompt_chars:
                error = pb_utils.TritonError(
                    f"the prompt has {len(prompt)} characters: over this model's context of "
                    f"{self.max_prompt_chars}",
                    pb_utils.TritonError.INVALID_ARG,
                )
                sender.send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            self._generate(request, sender, prompt)
        return None

    def _generate(self, request, sender, prompt):
        max_tokens = _option(request, "max_tokens", DEFAULT_MAX_TOKENS)
        temperature = _option(request, "temperature", 1.0)
        top_p = _option(request, "top_p", 1.0)
        seed = _option(request, "seed", None)
        delay = _option(request, "token_delay_ms", 0) / 1000
        fail_after = _option(request, "fail_after_tokens", -1)
        stops = [s.decode("utf-8") for s in _option(request, "stop", [])]
        rng = np.random.default_rng(seed)
        text = prompt
        generated = ""
        sent = 0  # characters of `generated` sent so far
        hold = max((len(s) for s in stops), default=1) - 1  # what might still become a stop sequence
        tokens = reported = 0
        while tokens < max_tokens and not sender.is_cancelled():
            if tokens == fail_after:
                error = pb_utils.TritonError(f"charlm failed after {tokens} tokens, as asked")
                sender.send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                return
            character = self._next(text, rng, temperature, top_p)
            text += character
            generated += character
            tokens += 1
            stop_at = min((generated.find(s) for s in stops if s in generated), default=-1)
            if stop_at >= 0:  # the stop sequence is not part of the answer
                generated = generated[:stop_at]
                break
            if len(generated) - sent > hold:
                self._send(sender, generated[sent : len(generated) - hold], len(prompt), tokens - reported)
                sent, reported = len(generated) - hold, tokens
            if delay:
                time.sleep(delay)
        if sender.is_cancelled():
            pb_utils.Logger.log_info(f"charlm stopped after {tokens} of {max_tokens} tokens: cancelled")
            error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
            sender.send(
                pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
            return
        if sent < len(generated) or tokens > reported:
            self._send(sender, generated[sent:], len(prompt), tokens - reported)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _send(self, sender, text, input_tokens, output_tokens):
        outputs = [
            pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=object)),
            pb_utils.Tensor("num_input_tokens", np.array([input_tokens], dtype=np.uint32)),
            pb_utils.Tensor("num_output_tokens", np.array([output_tokens], dtype=np.uint32)),
        ]
        sender.send(pb_utils.InferenceResponse(outputs))
