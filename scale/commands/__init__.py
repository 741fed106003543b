"""Thin command-line layers over the library: parse arguments, call one function, print its result."""
