# Fixture for tests/test_payload.py: the marker logged by every rank from the worker's __init__.
import logging

logger = logging.getLogger(__name__)


class EAGLEWorker:
    def __init__(self, threshold):
        if threshold is not None:
            logger.info(
                f"Dynamic speculation disable enabled (worker={type(self).__name__}, threshold={threshold})"
            )
