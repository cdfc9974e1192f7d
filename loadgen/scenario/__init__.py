"""Scenario files: the dataclasses a scenario becomes, the YAML schema helper, and one parser per
section (docs/ARCHITECTURE.md, "Data flow")."""
