"""Generated stand-ins for downloads: the offline demo's dataset and tiny
pre-trained ViLT (`demo_data`, `demo_model`), and the fake real-layout dataset
trees and hub snapshots the tests build (`trees`)."""
