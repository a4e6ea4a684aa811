"""What the adapters share: the wire protocol, delivery of a stream as bytes, stored voices, model download."""
