"""Memory: ZeRO over the data axis (FSDP2) and activation checkpointing of decoder layers."""
