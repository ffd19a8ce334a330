#!/usr/bin/env bash
mkdir -p /tmp/parts && cp .carry/* /tmp/parts/ && ls /tmp/parts
