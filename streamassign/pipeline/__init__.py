"""The simulation and planning pipeline: churn traces replayed through assignors, on Spark.

Layers, from pure to Spark:

- :mod:`~streamassign.pipeline.scenarios`: the scenario model and trace generation;
- :mod:`~streamassign.pipeline.assignors` and :mod:`~streamassign.pipeline.peers`: the assignors
  compared (ours, faust-streaming's, aiokafka's) and their drivers;
- :mod:`~streamassign.pipeline.simulate`: replaying a trace, one scored row per rebalance;
- :mod:`~streamassign.pipeline.standbys`: the availability model behind ``plan-standbys``;
- :mod:`~streamassign.pipeline.report`: the HTML/CSV report from aggregated rows;
- :mod:`~streamassign.pipeline.spark`: the Spark jobs (the only module importing ``pyspark``);
- :mod:`~streamassign.pipeline.runs`: run folders written aside and published whole;
- :mod:`~streamassign.pipeline.preflight`: checks before a JVM starts (Java, master, sizes);
- :mod:`~streamassign.pipeline.progress`: progress of Spark jobs on the terminal;
- :mod:`~streamassign.pipeline.signals`: Ctrl-C, SIGTERM and SIGHUP as one interrupt, deferred
  over steps that must not stop halfway;
- :mod:`~streamassign.pipeline.submit`: the ``spark-submit`` entry point.

Importing this package imports neither Spark nor the report's plotly and jinja2. See
``docs/pipeline.md``.
"""

from .assignors import resolve
from .scenarios import PipelineError, ScenarioModel, Workload, generate_trace
from .simulate import COLUMNS, RebalanceRow, SimulationJob, simulate_scenario

__all__ = [
    "COLUMNS",
    "PipelineError",
    "RebalanceRow",
    "ScenarioModel",
    "SimulationJob",
    "Workload",
    "generate_trace",
    "resolve",
    "simulate_scenario",
]
