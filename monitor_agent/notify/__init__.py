"""Notification channels and the durable outbox that delivers to them."""
