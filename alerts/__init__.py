"""gpuwatt alert evaluator (rules, state, email and Slack delivery). Lands with its issue."""
