"""The OpenAI frontend's metric families: time to first token, inter-token latency, tokens.

Triton's OpenAI frontend has no families of its own (its deployments read the vLLM backend's
`vllm:time_to_first_token_seconds`, `vllm:time_per_output_token_seconds`,
`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`). These follow those names, units
and buckets under coreserve's prefix, since no vLLM engine produces them here; the labels are
the model's and its version's, as on Triton's nv_* families. They join the server's custom
families, so the metrics endpoint writes them beside the others.
"""

from __future__ import annotations

from coreserve.backend.custom_metrics import CustomMetric, CustomMetricFamily, CustomMetrics, MetricKind

TIME_TO_FIRST_TOKEN = "coreserve_openai_time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "coreserve_openai_inter_token_latency_seconds"
PROMPT_TOKENS = "coreserve_openai_prompt_tokens_total"
GENERATION_TOKENS = "coreserve_openai_generation_tokens_total"
# vLLM's buckets for the same two histograms.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class ModelTokenMetrics:
    """The four metrics of one model version."""

    def __init__(self, families: OpenAIMetrics, labels: dict[str, str]) -> None:
        self.time_to_first_token: CustomMetric = families.ttft.metric(labels, TTFT_BUCKETS)
        self.inter_token_latency: CustomMetric = families.itl.metric(labels, ITL_BUCKETS)
        self.prompt_tokens: CustomMetric = families.prompt.metric(labels)
        self.generation_tokens: CustomMetric = families.generation.metric(labels)


class OpenAIMetrics:
    """The families, and each model version's metrics in them."""

    def __init__(self, custom: CustomMetrics) -> None:
        self.ttft = CustomMetricFamily(
            TIME_TO_FIRST_TOKEN,
            "Histogram of time to first token in seconds (OpenAI frontend)",
            MetricKind.HISTOGRAM,
        )
        self.itl = CustomMetricFamily(
            INTER_TOKEN_LATENCY,
            "Histogram of the time between two streamed chunks in seconds (OpenAI frontend)",
            MetricKind.HISTOGRAM,
        )
        self.prompt = CustomMetricFamily(
            PROMPT_TOKENS,
            "Number of prefill tokens processed, as models report them (OpenAI frontend)",
            MetricKind.COUNTER,
        )
        self.generation = CustomMetricFamily(
            GENERATION_TOKENS,
            "Number of generation tokens processed: as models report them, else one per streamed chunk "
            "(OpenAI frontend)",
            MetricKind.COUNTER,
        )
        for family in (self.ttft, self.itl, self.prompt, self.generation):
            custom.add_server_family(family)
        self._models: dict[tuple[str, int], ModelTokenMetrics] = {}

    def model(self, name: str, version: int) -> ModelTokenMetrics:
        found = self._models.get((name, version))
        if found is None:
            labels = {"model": name, "version": str(version)}
            found = self._models[(name, version)] = ModelTokenMetrics(self, labels)
        return found
