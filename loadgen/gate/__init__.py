"""``slobench gate``: CI rules over two summaries (a run and its baseline), their evaluation, and the
text / JUnit / markdown outputs.

Modules, lowest first: ``values`` (shared vocabulary), ``lookup`` (reading summaries, resolving metric
paths and aliases), ``pool`` (several runs of one side as one summary), ``rules`` (rules, defaults, rules
YAML), ``evaluate`` (rule results, ``gate()``),
``output`` (text, JUnit, markdown), ``command`` (the CLI entry). The names below are the package's
public API; ``loadgen.report.compare`` reads metrics through them. In a capacity summary the run-level
latency keys (``p99_ttft_ms`` ...) are looked up in the rated step's ``summary`` (the highest passing
step; the lightest step when none passed).
"""

from loadgen.gate.command import main
from loadgen.gate.evaluate import EXIT_PASS, EXIT_REGRESSION, EXIT_UNUSABLE, GateReport, Result, evaluate_rule, gate
from loadgen.gate.lookup import ALIASES, completed, kind, load_summary, rated_step, resolve
from loadgen.gate.output import junit_xml, markdown, text_lines
from loadgen.gate.pool import pool
from loadgen.gate.rules import (
    CHECKS,
    DEFAULT_RULES_CAPACITY,
    DEFAULT_RULES_CAPACITY_CONCURRENCY,
    DEFAULT_RULES_RUN,
    OPTIONS,
    RELATIVE,
    Rule,
    default_rules,
    load_rules,
    parse_rules,
)
from loadgen.gate.values import MISSING, GateInputError, format_value, is_number

__all__ = [
    "ALIASES", "CHECKS", "DEFAULT_RULES_CAPACITY", "DEFAULT_RULES_CAPACITY_CONCURRENCY", "DEFAULT_RULES_RUN",
    "EXIT_PASS", "EXIT_REGRESSION", "EXIT_UNUSABLE", "MISSING", "OPTIONS", "RELATIVE", "GateInputError",
    "GateReport", "Result", "Rule", "completed", "default_rules", "evaluate_rule", "format_value", "gate",
    "is_number", "junit_xml", "kind", "load_rules", "load_summary", "main", "markdown", "parse_rules",
    "pool", "rated_step", "resolve", "text_lines",
]
