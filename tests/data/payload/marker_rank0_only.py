# Fixture for tests/test_payload.py: the marker from __init__, but on TP rank 0 only (must be refused).
import logging

from sglang.srt.utils import log_info_on_rank0

logger = logging.getLogger(__name__)


class EAGLEWorker:
    def __init__(self, threshold):
        log_info_on_rank0(logger, f"Dynamic speculation disable enabled (threshold={threshold})")
