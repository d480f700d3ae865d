"""Helpers the test suite shares: stand-ins for services and drivers for real programs."""
