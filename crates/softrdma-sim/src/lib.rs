//! Deterministic simulation of softrdma endpoints over a faulty virtual network.
