"""Capacity planning (``slobench plan``): theory from the model's and the accelerator's sizes, a calibration
probe that measures the step time, a discrete-event simulation of continuous batching that predicts the
rated capacity, and the comparison of that prediction with a measured ``slobench capacity`` run."""
