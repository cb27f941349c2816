"""The private descriptor pool that coreserve's generated protobuf modules register in."""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
