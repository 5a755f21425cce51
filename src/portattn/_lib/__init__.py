"""Private helpers shared across portattn. Nothing here is public API."""
