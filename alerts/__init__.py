"""Policy -> Prometheus rules, Alertmanager routing, HPA metric rules and the Grafana dashboard."""
