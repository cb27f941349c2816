"""The OpenAI frontend's test models: a character n-gram language model trained here, and an embedder.

`openai_repository` copies tests/support/servers/openai_models into a folder and trains the language model's
counts into it (a fraction of a second; nothing is downloaded). `openai_url` finds the port the
frontend of a started server listens on.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections import Counter, defaultdict
from pathlib import Path

from coreserve.testing import ServerProcess

MODELS = Path(__file__).parent / "openai_models"
ORDER = 3  # characters of context plus one
CORPUS = """
The server reads its models from a repository, loads each version, and answers requests for
them. A request names a model and carries its inputs; the answer carries the outputs. When many
clients ask at once, the scheduler groups their requests into batches, and each instance of the
model runs one batch at a time. A model that streams sends a response for every piece of text
it writes, and the client reads the pieces as they come. When the client goes away, the model
stops writing, and the server counts the request as cancelled. The metrics tell how long the
first piece took to arrive, how long each piece after it took, and how many pieces were written.
Small models are quick to train: count which letter follows each pair of letters in the text,
and sample the next letter from those counts, a little more boldly at a higher temperature.
"""
_LISTENING = re.compile(r"Started OpenAIService at ([^\s:]+):(\d+)")


def train_char_ngrams(text: str, order: int = ORDER) -> dict[str, object]:
    """Counts of the character that follows each context of `order - 1` characters."""
    text = " ".join(text.split())
    alphabet = sorted(set(text))
    index = {character: position for position, character in enumerate(alphabet)}
    follows: dict[str, Counter[str]] = defaultdict(Counter)
    for position in range(len(text) - order + 1):
        follows[text[position : position + order - 1]][text[position + order - 1]] += 1
    counts = {}
    for context, seen in follows.items():
        row = [0] * len(alphabet)
        for character, count in seen.items():
            row[index[character]] = count
        counts[context] = row
    unigram = Counter(text)
    return {
        "order": order,
        "alphabet": alphabet,
        "counts": counts,
        "unigram": [unigram[character] for character in alphabet],
    }


def openai_repository(root: Path) -> Path:
    """A repository with `charlm` (trained here) and `embedder`."""
    shutil.copytree(MODELS, root, dirs_exist_ok=True)
    (root / "charlm" / "1" / "ngrams.json").write_text(json.dumps(train_char_ngrams(CORPUS)))
    return root


def openai_url(server: ServerProcess, timeout: float = 30.0) -> str:
    """The base URL (http://host:port/v1) of a started server's OpenAI frontend."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _LISTENING.search(server.log)
        if found:
            return f"http://{found.group(1)}:{found.group(2)}/v1"
        time.sleep(0.05)
    raise TimeoutError(f"the OpenAI frontend did not start within {timeout}s:\n{server.log}")
