"""What faces the operating system: files written atomically, storage
errors, locks, processes and peers, host memory, platforms, background
threads' errors, the compilation cache, console and TensorBoard output."""
