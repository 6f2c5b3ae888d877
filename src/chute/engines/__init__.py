"""Engines move batches between stages; the stage logic lives in :mod:`chute.stages`."""
