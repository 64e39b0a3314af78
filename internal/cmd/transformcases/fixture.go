package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights/transform"
)

// fixtureCase is one case a transformers fixture records: an expression
// over tensors of inputs.safetensors, and the tensor holding what
// transformers computed.
type fixtureCase struct {
	Name     string          `json:"name"`
	Expr     *transform.Expr `json:"expr"`
	Expected string          `json:"expected"`
}

func writeFixtureCases(dir, fixture string) error {
	data, err := os.ReadFile(filepath.Join(fixture, "cases.json"))
	if err != nil {
		return err
	}
	var fcs []fixtureCase
	if err := json.Unmarshal(data, &fcs); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(fixture, "cases.json"), err)
	}
	src := filepath.Join(fixture, "inputs.safetensors")
	ckpt, err := checkpoint.OpenFile(src)
	if err != nil {
		return err
	}
	var cases []caseInfo
	for _, fc := range fcs {
		expected, err := ckpt.ReadTensor(fc.Expected)
		if err != nil {
			return err
		}
		info, err := writeCase(dir, fc.Name, src, fc.Expr, expected)
		if err != nil {
			return fmt.Errorf("case %s: %w", fc.Name, err)
		}
		cases = append(cases, info)
	}
	return writeIndex(dir, cases)
}
