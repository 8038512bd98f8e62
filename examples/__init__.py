"""Example Flows, written as a Flow author would: against the Connectors SDK only."""
