"""A platform team's first hour: one policy, `gpupool init`, the shipped model configs."""
