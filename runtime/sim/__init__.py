"""What-if engine: closed-loop replay of a GPU cluster under a policy."""
