"""Measuring: the one timer and the one interleaving, input sets with their true layouts, the
comparison of outputs, the judge's memory, the roofline, Inductor's code as a baseline, and the
statistics decisions are made from. Imports only the foundation."""
