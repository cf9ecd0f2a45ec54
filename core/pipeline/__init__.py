"""End-to-end runs built from the library: conversion, ablation, distributed stages, run folders and exports."""
