"""Controlplane: pack lifecycle, fences, protocol rows and cutover."""
