"""What every long-running podwire process shares: health and Prometheus endpoints."""
