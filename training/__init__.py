"""The consuming side: selection, forest, rows, batches, advantages, loss, projector, trainer."""
