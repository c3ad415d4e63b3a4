"""The data: the dataset readers (`datasets`), the missing-modality protocol,
the samples' schema and the loader that batches them."""
