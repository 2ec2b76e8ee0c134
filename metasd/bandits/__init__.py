"""Policies that choose the drafter each round, their informed priors, and the playground's simulator."""
