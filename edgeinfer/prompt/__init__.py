"""prompt"""
