"""One run of the codemod over its files: in this process or in workers, the fast path for converted files, progress, stopping."""
