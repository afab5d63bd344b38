"""Server aggregation rules: streaming (linear, O(|theta|)) and gather-all (sees every update); see base.py."""

from resfl_lightning.aggregation.base import AggregationRule, GatherAllRule, GatherMemoryError, StreamingRule

__all__ = ["AggregationRule", "GatherAllRule", "GatherMemoryError", "StreamingRule"]
