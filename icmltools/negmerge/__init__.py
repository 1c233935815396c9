"""NegMerge (Kim et al., ICML 2025): sign-consensual task-vector merging for machine unlearning."""
