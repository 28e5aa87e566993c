# Fixture for tests/test_payload.py: the marker is logged, but not from __init__ (must be refused).
import logging

logger = logging.getLogger(__name__)


class EAGLEWorker:
    def __init__(self, threshold):
        self.threshold = threshold

    def forward_batch_generation(self, batch):
        logger.info(f"Dynamic speculation disable enabled (threshold={self.threshold})")
