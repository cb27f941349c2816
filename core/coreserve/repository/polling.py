"""Poll mode's loop: the repository looked at every few seconds, whatever a look raises."""

from __future__ import annotations

import asyncio
import logging

from coreserve.errors import CoreserveError
from coreserve.repository.manager import ModelRepository

logger = logging.getLogger("coreserve.repository.manager")


async def poll_forever(repository: ModelRepository, interval: float) -> None:
    """Polls every `interval` seconds until cancelled; a failed poll is logged in one line and
    the next one tries again (the models being served keep serving meanwhile)."""
    failing = False
    while True:
        await asyncio.sleep(interval)
        try:
            await repository.poll()
        except CoreserveError as exc:
            logger.error("polling the model repository failed: %s", exc.message)
            failing = True
        except Exception as exc:  # polling must go on whatever a repository source raises
            logger.error("polling the model repository failed: %s: %s", type(exc).__name__, exc)
            failing = True
        else:
            if failing:
                logger.info("polling the model repository works again")
            failing = False
