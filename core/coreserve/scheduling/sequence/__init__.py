"""The sequence batcher for stateful models: slots, control tensors and implicit state."""
