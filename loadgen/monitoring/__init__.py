"""The five service-health signals watched live against a capacity run's rated step (``slobench watch``) and
exported as a Grafana dashboard and Prometheus alerting rules (``slobench export-monitoring``)."""
